"""What every pure parser raises when the text is not the tool's output."""


class ParseError(ValueError):
    """The text is not what the tool (or payload) prints; the message says what was expected."""
