import os

CONFIG = os.environ["ALI_SURELY_MISSING_VARIABLE"]
