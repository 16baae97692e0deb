"""Images in: vision towers traced as poot graphs, whose output rows the language model reads
through the hosted embedding rows of its prefill (poot.models.hosted_rows).

- config: a Gemma 3 or Idefics3 (SmolVLM) config.json split into the text model's config
  and the tower's;
- weights: the checkpoint's vision tensors as a WeightSource, the language model's as a view;
- mmproj: a llama.cpp vision projector GGUF read as the same tower, for a GGUF language model
  (mmproj_tensors: its tensors checked; qwen25vl_mmproj: Qwen2.5-VL's);
- siglip: the SigLIP tower; connector: Gemma 3's pooling, norm and projection, Idefics3's
  pixel shuffle and projection;
- encoder: tower and connector as one graph, compiled and run per image (or tile) on a
  backend;
- preprocess: Pillow decoding, resize, rescale, normalize, Idefics3's tiling
  (preprocessor_config.json);
- template: the chat template rendered for an image turn;
- chat: the image tokens placed in the chat, and the rows fed at their positions;
  idefics3: Idefics3's image prompt;
- qwen25vl (and its _config, _weights, _preprocess, _chat): Qwen2.5-VL's tower graph per
  image grid, config, tensors, processor and image prompt with its M-RoPE positions.
"""
