"""Image transforms compiled into the bundle: augmentations that run in the train step (named and
parameterised as torchvision.transforms.v2), see docs/transforms.md."""

from glcomp.transforms.preprocess import ImageInput, Preprocess, image_input

__all__: list[str] = ["ImageInput", "Preprocess", "image_input"]
