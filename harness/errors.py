"""Errors the CLI turns into one line and exit code 2 (bad input, never a traceback)."""


class UserError(Exception):
    """Bad input: the message names the file, the key and the reason."""


class SuiteError(UserError):
    def __init__(self, path: str, key: str, reason: str):
        # key "-": the file as a whole (no key to name), said without a stray "-:"
        super().__init__(f"{path}: {reason}" if key == "-" else f"{path}: {key}: {reason}")
        self.path, self.key, self.reason = path, key, reason
