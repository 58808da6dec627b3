def add(a, b: int) -> int:
    """Add two numbers.

    Args:
        a: first
        b: second
    """
    return a + b
