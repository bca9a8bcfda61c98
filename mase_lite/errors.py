"""Errors a user can cause. The CLI turns every ``UserError`` into a one-line message and exit code 2."""


class UserError(ValueError):
    """A bad spec, an unknown name, an impossible parameter, a missing input: the user can fix it."""
