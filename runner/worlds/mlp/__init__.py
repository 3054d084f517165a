"""`policy=mlp`: one MLP shared by every state (world.py), its features and forward pass in any
precision (model.py), and the exact J(θ) for count tasks by dynamic programming (exact.py)."""
