"""IPython startup file of the book's kernels (docs/book/build_book.py copies it into <out>/ipython): tqdm.auto
gives a text bar that suits a page rendered once.

In a kernel tqdm.auto draws an ipywidgets bar; a static page has no widget manager, so it shows the widget's text
fallback, frozen at "0%". tqdm's own text bar redraws with carriage returns and, for nested bars, cursor moves
("\\x1b[A") that a page cannot replay, leaving a "0%" line per inner bar. This bar writes nothing while it runs and,
when it closes, one line with its final state (a bar closed with ``leave=False`` leaves nothing, as in a terminal):

    N sweep: 100%|##########| 5/5 [00:12<00:00,  2.41s/it]
"""

import tqdm.auto
import tqdm.std


class StaticTextBar(tqdm.std.tqdm):
    """tqdm's text bar, drawn once, at close, with no cursor movement."""

    def display(self, msg=None, pos=None):
        if msg is None and getattr(self, "_closing", False):
            self.fp.write("\r" + self.__str__())
        return True

    def close(self):
        self._closing = True
        super().close()


def static_trange(*args, **kwargs):
    return StaticTextBar(range(*args), **kwargs)


tqdm.auto.tqdm, tqdm.auto.trange = StaticTextBar, static_trange
