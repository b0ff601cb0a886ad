"""The recorder's cost per item: what the session collected is kept out of the garbage collector."""
from __future__ import annotations

import gc

from handover import recorder
from handover.recorder import Recorder

pytest_plugins = ["pytester"]  # a file outside the rootdir, collected as pytest itself collects it


def test_collected_items_are_frozen_out_of_the_collector_and_unfrozen_at_the_end(request):
    gc.unfreeze()
    Recorder(append=lambda entry: None).pytest_collection_finish(request.session)
    try:
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # the cleanup it registered does the same once this session ends
    assert gc.get_freeze_count() == 0


def test_a_test_file_outside_the_rootdir_is_named_by_its_path_in_the_ledger(pytester):
    """pytest names such a file's tests `::test_same`: two files would share an id, and --resume
    would take one's result for the other's."""
    files = []
    for folder in ("root", "elsewhere"):
        (pytester.path / folder).mkdir()
        files.append(pytester.path / folder / f"test_{folder}.py")
        files[-1].write_text("def test_same():\n    pass\n")
    inside, outside = files
    items, _ = pytester.inline_genitems(str(inside), str(outside), f"--rootdir={inside.parent}")
    assert [item.nodeid for item in items] == ["test_root.py::test_same", "::test_same"]
    assert [recorder.test_id(item) for item in items] == ["test_root.py::test_same",
                                                          f"{outside.as_posix()}::test_same"]
