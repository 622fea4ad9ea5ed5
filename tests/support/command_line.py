"""What the command-line tests share: a refused command line is one line and exit status 2."""
import pytest


def refused_in_one_line(capsys, call, *args):
    """Runs call(*args), which must exit with status 2 after one line on stderr: the line."""
    with pytest.raises(SystemExit) as exit_info:
        call(*args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err
