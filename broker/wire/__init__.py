"""The wire layer shared by broker and client: error tree, Arrow batch codec, routing."""
