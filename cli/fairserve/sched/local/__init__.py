"""Local policies: which waiting requests one engine admits at each batching step."""
