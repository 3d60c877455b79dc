"""The one exception type the CLI turns into a clear message instead of a traceback."""


class OomLabError(Exception):
    """Something the user can act on: what happened, and what to do about it."""

    def __init__(self, what: str, todo: str = ""):
        super().__init__(what)
        self.what = what
        self.todo = todo

    def __str__(self) -> str:
        return f"{self.what}\n{self.todo}" if self.todo else self.what
