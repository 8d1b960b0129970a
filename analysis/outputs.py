"""
The files a user names for the analysis scripts to write (analysis.attribute's --html / --figure, plot.py's
and countdown_demo.py's --out): never a file someone else made.

    check_new_file(path, key, ours, writer)    # before any work: new, or one ours(path) recognises
    save_figure(fig, path, mark, ours, writer)  # written beside, then moved: never over another's
    put_in_place(tmp, path, ours, writer)       # the same for any file written whole to tmp first

A figure carries `mark` in its metadata (PNG, PDF, SVG, PostScript; no parentheses: PDF escapes
them), so that the script that wrote it may write it again; a format without metadata (JPEG, TIFF,
WebP) is written only where no file is.
"""
import os
import tempfile

from configurator import UserError

# the formats matplotlib's own backends write (no LaTeX run, no extra package)
FIGURE_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")


def has_mark(path, marks):
    """Whether the file at path holds one of `marks` (bytes) in its first or last 4 KiB (a PDF's
    metadata lies at its end)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            tail = f.read()
    except OSError:
        return False
    return any(m in head or m in tail for m in marks)


def figure_format(path, key):
    """The format an image path asks for (its extension), refused unless matplotlib writes it."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in FIGURE_FORMATS:
        what = f".{ext} files" if ext else "a file without an extension"
        raise UserError(f"--{key}={path}: matplotlib cannot write {what}; give a name ending in "
                        f".{', .'.join(FIGURE_FORMATS)}")
    return ext


def check_new_file(path, key, ours, writer):
    """Refuse, before any work, an output path that is a directory, lies in a directory that does
    not exist or takes no new file, or holds a file that ours(path) does not recognise (writer: who
    may replace it)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not path or os.path.isdir(path) or not os.path.isdir(folder):
        raise UserError(f"cannot write {key} {path}: it is a directory, or its directory does not "
                        "exist; give a file path in an existing directory")
    try:  # a read-only or special directory (/proc) is refused now, not after the work
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise UserError(f"cannot write {key} {path}: its directory takes no new file "
                        f"({e.strerror}); give a path in a writable directory") from None
    if (os.path.lexists(path) and not os.path.isfile(path)) or os.path.islink(path):
        raise UserError(f"{key} {path} is a link or a special file: it is never replaced; "
                        "give another path")
    if os.path.exists(path) and not ours(path):
        raise UserError(f"{key} {path} exists and was not written by {writer}: it is never "
                        "overwritten; remove it, or give another path")


def mark_metadata(fmt, mark):
    """savefig's metadata that carries `mark` in a file of format fmt ({}: it keeps none)."""
    if fmt in ("png", "pdf", "svg", "svgz"):
        return {"Title": mark}
    return {"Creator": mark} if fmt in ("eps", "ps") else {}


def file_beside(path, suffix=""):
    """A new empty file of a fresh name beside `path` (never a name someone else may use), with the
    permissions open() would give it, to be written whole and then put_in_place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=suffix,
                               dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's file is private
    return tmp


def put_in_place(tmp, path, ours, writer):
    """The complete file tmp at path: it replaces a file ours(path) recognises, or takes a free name
    by a hard link, which fails on a file made meanwhile (refused, left as it is). tmp is gone
    after."""
    try:
        if os.path.exists(path) and not os.path.islink(path) and ours(path):
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise UserError(f"{path} appeared while it was written and was not written by "
                                f"{writer}: it is left as it is; give another path") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def save_figure(fig, path, mark, ours, writer, key="out"):
    """fig into path, in the format its extension names, carrying `mark`: written to a new file
    beside it, then put_in_place. Returns path."""
    fmt = figure_format(path, key)
    tmp = file_beside(path, f".{fmt}")
    try:
        fig.savefig(tmp, format=fmt, metadata=mark_metadata(fmt, mark))
    except OSError as e:  # a full disk: named by the figure's path, not the temporary file's
        os.remove(tmp)
        raise OSError(e.errno, f"{e.strerror or e} (writing the figure)", path) from None
    except BaseException:
        os.remove(tmp)
        raise
    return put_in_place(tmp, path, ours, writer)
