// Usage: node roundtrip.js <endpoints> <topic> <keys> <perKey>
// FIFO-produce (key, seq) JSON bodies with message group = key, then SimpleConsumer-receive and ack
// until all came; print every delivery as one JSON line {key, seq} in the order received.
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

async function main() {
  const [endpoints, topic, keys, perKey] = process.argv.slice(2);
  const total = Number(keys) * Number(perKey);
  const producer = new Producer({ endpoints });
  await producer.startup();
  for (let seq = 0; seq < Number(perKey); seq++) {
    for (let k = 0; k < Number(keys); k++) {
      const key = `node-${k}`;
      await producer.send({ topic, messageGroup: key, tag: 'TagN', keys: [`${key}#${seq}`],
        body: Buffer.from(JSON.stringify({ key, seq })) });
    }
  }
  await producer.shutdown();
  const consumer = new SimpleConsumer({ consumerGroup: 'node-group', endpoints, awaitDuration: 1000,
    subscriptions: new Map().set(topic, '*') });
  await consumer.startup();
  const seen = new Set();
  const deadline = Date.now() + 30000;
  while (seen.size < total && Date.now() < deadline) {
    for (const message of await consumer.receive(16, 20000)) {
      const event = JSON.parse(message.body.toString());
      console.log(JSON.stringify(event));
      seen.add(`${event.key}#${event.seq}`);
      await consumer.ack(message);
    }
  }
  await consumer.shutdown();
}

main().then(() => process.exit(0), (err) => { console.error(err); process.exit(1); });
