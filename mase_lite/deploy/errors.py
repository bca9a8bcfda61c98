"""The one error of export and import: a model, a layer, a format or a file a target cannot hold or read."""

from mase_lite.infra.errors import UserError


class ExportError(UserError):
    """A model, a layer or a format the chosen target cannot hold: raised before anything is written."""
