"""Tool functions for the .py loader tests (trusted: imported in-process)."""

import asyncio
from os.path import join  # noqa: F401  - imported functions are not tools

UNIT = "celsius"


def get_current_temperature(city: str, unit: str = UNIT) -> dict:
    """Get the current temperature in a city.

    Args:
        city: The city, e.g. "Paris, France"
        unit: celsius or fahrenheit
    """
    return {"city": city, "temperature": 22, "unit": unit}


async def get_forecast(city: str, days: int) -> str:
    """Get the forecast.

    Args:
        city: The city
        days: How many days
    """
    await asyncio.sleep(0)
    return f"{days} sunny days in {city}"


def helper_without_docstring(x):
    return x


def _private(city: str) -> str:
    """Private helpers are not tools.

    Args:
        city: a city
    """
    return city


alias = get_current_temperature  # an alias is not a second tool
