"""Images in: vision towers traced as poot graphs, whose output rows the language model reads
through the hosted embedding rows of its prefill (poot.models.hosted_rows).

- config: a Gemma 3 vision config.json split into the text model's config and the tower's;
- weights: the checkpoint's vision tensors as a WeightSource, the language model's as a view;
- siglip: the SigLIP tower; connector: Gemma 3's pooling, norm and projection;
- encoder: tower and connector as one graph, compiled and run per image on a backend;
- preprocess: Pillow decoding, resize, rescale, normalize (preprocessor_config.json);
- prompt: the image tokens placed in the chat, and the rows fed at their positions.
"""
