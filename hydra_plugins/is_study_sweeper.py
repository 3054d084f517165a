"""is-study's sweeper, where Hydra looks for plugins.

Hydra instantiates a sweeper only from a class defined in the `hydra_plugins` namespace package (its
plugin rule), and imports every module of that package when it starts, in every process. So this module
stays this small: the sweeper is runner/hydra_app/sweeper.py; here it gets the name that
`hydra.sweeper._target_` gives, and its config is registered as `hydra/sweeper=is-study`.
"""

from runner.hydra_app.sweeper import ExpandingSweeper, register_config


class IsStudySweeper(ExpandingSweeper):
    """runner.hydra_app.sweeper.ExpandingSweeper under a name Hydra accepts as a plugin."""


register_config(target=f"{__name__}.{IsStudySweeper.__name__}")
