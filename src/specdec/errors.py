"""The one exception type users see: its message is shown as ``error: <message>`` by the CLI and
returned as a 400 by the server, so it must read as a sentence that says what to do."""


class SpecdecError(Exception):
    """Bad input or an unusable environment (unknown model, empty prompt, K < 1, ...)."""


class OptionError(SpecdecError):
    """A generation option with a bad value; ``option`` names it (the server's ``param``)."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option
