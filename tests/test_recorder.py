"""The recorder's cost per item: what the session collected is kept out of the garbage collector."""
from __future__ import annotations

import gc

from handover.recorder import Recorder


def test_collected_items_are_frozen_out_of_the_collector_and_unfrozen_at_the_end(request):
    gc.unfreeze()
    Recorder(append=lambda entry: None).pytest_collection_finish(request.session)
    try:
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # the cleanup it registered does the same once this session ends
    assert gc.get_freeze_count() == 0
