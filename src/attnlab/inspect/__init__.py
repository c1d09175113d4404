"""Look inside a model: record attention and activations with hooks, plot them, compute head
statistics and token attributions (``record``, ``plots``, ``heads``, ``attribution``, ``rollout``)."""
