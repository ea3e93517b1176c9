"""timelyllm_ros.paths: the one data-directory resolver (source tree, else the installed share)."""

from pathlib import Path

from timelyllm_ros import paths


def test_source_tree_first():
    assert paths.data_dir("robots") == paths.SOURCE_ROOT / "robots"
    assert (paths.data_dir("robots") / "tello.yaml").is_file()


def test_installed_share_when_the_source_tree_lacks_it(tmp_path, monkeypatch):
    share = tmp_path / "share" / "timelyllm"
    (share / "robots").mkdir(parents=True)
    monkeypatch.setattr(paths, "SOURCE_ROOT", tmp_path / "src")
    monkeypatch.setattr(paths, "installed_share", lambda: share)
    assert paths.data_dir("robots") == share / "robots"
    # neither has it: the source tree's path, so its user's error names what was expected
    assert paths.data_dir("profiles") == tmp_path / "src" / "profiles"
    monkeypatch.setattr(paths, "installed_share", lambda: None)
    assert paths.data_dir("robots") == tmp_path / "src" / "robots"


def test_installed_share_is_ament_lookup(monkeypatch):
    monkeypatch.delenv("AMENT_PREFIX_PATH", raising=False)
    found = paths.installed_share()
    assert found is None or isinstance(found, Path)
