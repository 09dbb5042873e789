"""The visual PLE lab (SPEC §4): image loading, captions, visual tokenizers, the tokenized corpus, the model.

A plug-in of the trainer: importing this package registers the `[vision]` training-config section
(plelab.vision.plugin.VisionTrainConfig, which names VisionTrainer). The other modules are imported on demand
(`from plelab.vision.images import load_images`), so loading images never pulls in torch or the tokenizer
libraries.
"""

from plelab.vision import plugin as _plugin  # noqa: F401 - registers the [vision] section with TrainConfig
