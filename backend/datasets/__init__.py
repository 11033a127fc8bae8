"""Dataset upload, client-side encryption, access grants, per-dataset privacy budget."""
