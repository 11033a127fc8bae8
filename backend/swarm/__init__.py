"""The decentralized chunk store: chunking, references, encryption, placement, peer API."""
