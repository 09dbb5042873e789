"""The visual PLE lab (SPEC §4): image loading, captions, visual tokenizers, the tokenized corpus, the model.

Modules are imported on demand (`from plelab.vision.images import load_images`), so loading images never pulls
in torch or the tokenizer libraries.
"""
