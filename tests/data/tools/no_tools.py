def helper(x):
    return x


def _hidden(x: int) -> int:
    """Hidden.

    Args:
        x: a number
    """
    return x
