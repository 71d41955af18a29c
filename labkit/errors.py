class LabkitError(Exception):
    """A failure the user can fix; the CLI prints its message in one line and exits with `code`."""
    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code
