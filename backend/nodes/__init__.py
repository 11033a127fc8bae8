"""This node's identity (Ethereum key), peers mirrored from the chain, health."""
