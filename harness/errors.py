"""Errors the CLI turns into one line and exit code 2 (bad input, never a traceback)."""


class UserError(Exception):
    """Bad input: the message names the file, the key and the reason."""


class SuiteError(UserError):
    def __init__(self, path: str, key: str, reason: str):
        super().__init__(f"{path}: {key}: {reason}")
        self.path, self.key, self.reason = path, key, reason
