"""is-study's sweeper, where Hydra looks for plugins.

Hydra instantiates a sweeper only from a class defined in the `hydra_plugins` namespace package (its
plugin rule), and imports every module of that package when it starts, in every process (a launcher's
workers again for every job). So this module stays this small: the sweeper is
runner/hydra_app/sweeper.py, and here it gets the name `hydra.sweeper._target_` gives
(runner.hydra_app.sweeper.PLUGIN_CLASS); its config, `hydra/sweeper=is-study`, is registered there.
"""

from runner.hydra_app.sweeper import ExpandingSweeper


class IsStudySweeper(ExpandingSweeper):
    """runner.hydra_app.sweeper.ExpandingSweeper under a name Hydra accepts as a plugin."""
