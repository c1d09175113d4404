"""Looking inside trained models: attention rollout, saliency maps, attention plots."""
