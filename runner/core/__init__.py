"""The algebra: pure maths and the column names it writes.

corrections (a correction is data, applied by one evaluator), losses (the policy losses and their
reductions), metrics (the correction metrics), masking (the masks they share) and schema (the CSV
columns). Nothing here reads a config, a file or a world.
"""
