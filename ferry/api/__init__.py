"""ferry's shared, side-effect-free models: the Migration API and every workflow and activity input."""
