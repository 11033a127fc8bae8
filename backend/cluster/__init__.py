"""A node's compute as a managed cluster: workers, their device slots, and the local tasks placed on them."""
