package org.orderlymq.hadoop;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

/**
 * Hadoop's local file system (checksums included), setting permissions through java.nio.
 *
 * <p>Without Hadoop's native library, which Spark's pip and tarball distributions do not ship,
 * {@code RawLocalFileSystem} forks {@code chmod} for every file and directory it creates. A
 * streaming query writes two checkpoint files per micro-batch (offset log and commit log), each
 * with its checksum file: four forks, 5 ms each on a busy machine. Enabled with
 * {@code spark.hadoop.fs.file.impl=org.orderlymq.hadoop.ForklessLocalFileSystem}.
 */
public class ForklessLocalFileSystem extends LocalFileSystem {
  public ForklessLocalFileSystem() {
    super(new NioPermissions());
  }

  static final class NioPermissions extends RawLocalFileSystem {
    // Bit i of a POSIX mode, from others' execute (bit 0) to the owner's read (bit 8).
    private static final PosixFilePermission[] MODE_BITS = {
      PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
    };

    @Override
    public void setPermission(Path path, FsPermission permission) throws IOException {
      // java.nio has no sticky bit: such a mode still goes through Hadoop's own way.
      if (NativeIO.isAvailable() || permission.getStickyBit()) {
        super.setPermission(path, permission);
        return;
      }
      Set<PosixFilePermission> bits = EnumSet.noneOf(PosixFilePermission.class);
      short mode = permission.toShort();
      for (int bit = 0; bit < MODE_BITS.length; bit++) {
        if ((mode & (1 << bit)) != 0) {
          bits.add(MODE_BITS[bit]);
        }
      }
      try {
        Files.setPosixFilePermissions(pathToFile(path).toPath(), bits);
      } catch (NoSuchFileException e) {
        throw new FileNotFoundException("File " + path + " does not exist");
      }
    }
  }
}
