"""The one error type users see: `PlelabError` subclasses carry a message the CLI prints as one line."""


class PlelabError(Exception):
    """An error the user can fix; the CLI prints its message as one line instead of a traceback."""


def token_id_message(vocab_size: int, bad: list[int]) -> str:
    """The one wording of 'ids outside the vocabulary', whichever part finds them (the PyTorch model's batches, the
    NumPy and C runtimes; plelab/edge/c/plerun.c prints the same text): the first few offending ids, in order."""
    return (f"token ids must lie in [0, {vocab_size}); got {[int(i) for i in bad[:5]]} "
            "(is the tokenizer the one this model was built for?)")
