"""The one error type users see for mistakes in models, inputs, bundles and shaders."""


class GlcompError(ValueError):
    """A mistake in what the user gave: the message names the model part, tensor or file at fault."""
