"""The check scripts' table of cases run in order (`lora_truth.py`, `qlora_truth.py`): each row
printed as one JSON line as it arrives, so a long run shows its errors as it goes, without the
field that would fill the screen (a case's config, a recording's assumptions)."""

import json


def measured(cases, run, hidden, imap=map):
    """(case, row) for each of `cases` in order, `row` being `run(case)`, through `imap` (a
    pool's, to run each in a process of its own)."""
    for c, row in zip(cases, imap(run, cases)):
        print(json.dumps({k: v for k, v in row.items() if k != hidden}), flush=True)
        yield c, row
