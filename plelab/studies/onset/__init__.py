"""Where the dead zone begins: the law's third round read across widths, gain against tokens per parameter."""
