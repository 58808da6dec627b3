def ok(x: int) -> int:
    """Fine.

    Args:
        x: a number
    """
    return x


def broken(x: int)
    return x
