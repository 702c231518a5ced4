"""Reading the decode timeline's CSV files (MOETIER_CUDA_TRACE=FILE writes FILE
and FILE.rows; scripts/trace_summary.py and scripts/trace_blocks.py): bad input
ends the tool with one line naming the file, never a traceback."""
import csv
import sys


def read_rows(path, tool, need, text=(), optional=()):
    """The rows of the CSV file path as dicts. Columns in text stay strings;
    the others are integers, except that a column in optional may be empty
    (None). need: the columns the header must have. A file that cannot be
    read, a missing column, a row with more cells than the header, or a cell
    that is not an integer (or empty outside optional) exits with one line
    naming tool, the file and the line."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in need if c not in (reader.fieldnames or [])]
            if missing:
                sys.exit(f"{tool}: {path}: no column '{missing[0]}' in its header")
            rows = []
            for r in reader:
                if None in r:
                    sys.exit(f"{tool}: {path}: line {reader.line_num}: more cells than the header")
                row = {}
                for k, v in r.items():
                    if k in text:
                        row[k] = v or ""
                    elif not v and k in optional:
                        row[k] = None
                    else:
                        try:
                            row[k] = int(v)
                        except (TypeError, ValueError):
                            sys.exit(f"{tool}: {path}: line {reader.line_num}: column '{k}' is "
                                     f"{v!r}, not an integer")
                rows.append(row)
            return rows
    except OSError as e:
        sys.exit(f"{tool}: {path}: {e.strerror or e}")
