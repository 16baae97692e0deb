"""Model support: checkpoints, tokenizers, chat templates, sampling and model builders."""
