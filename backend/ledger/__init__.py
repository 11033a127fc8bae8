"""The only code that talks to the chain: contract bindings, transaction sending, event indexer."""
