"""Image transforms compiled into the bundle: augmentations that run in the train step (named and
parameterised as torchvision.transforms.v2), see docs/transforms.md."""

from glcomp.transforms._base import Augmentation
from glcomp.transforms.color import ColorJitter, GaussianNoise, SaltAndPepperNoise
from glcomp.transforms.compose import Compose
from glcomp.transforms.geometry import (
    RandomAffine,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomVerticalFlip,
)
from glcomp.transforms.preprocess import ImageInput, Preprocess, image_input

__all__ = [
    "Augmentation",
    "ColorJitter",
    "Compose",
    "GaussianNoise",
    "ImageInput",
    "Preprocess",
    "RandomAffine",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomVerticalFlip",
    "SaltAndPepperNoise",
    "image_input",
]
