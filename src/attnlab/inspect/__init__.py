"""Look inside a model: record attention and activations with hooks (``record``), plot them
(``plots``), head statistics (``heads``), token attributions (``attribution``), attention rollout
(``rollout``) and ViT saliency maps (``saliency``)."""
