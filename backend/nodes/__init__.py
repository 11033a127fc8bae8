"""This node's users and their accounts, its registration on chain, the node overview and its views."""
