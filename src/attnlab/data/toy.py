"""The lecture's 4-token attention example, traced by hand in the lecture and by attnlab.

Tokens A, B, C, D with queries = keys Q (rows A=(1,0), B=(0,1), C=(1,1), D=(1,-1)) and values V
(10,0), (0,10), (5,5), (3,-3); d_k = 2. The hand-trace experiment checks every number of it, and the
explorer and ``inspect.plots.toy_example`` draw it.
"""

TOKENS = ["A", "B", "C", "D"]
Q = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0]]
V = [[10.0, 0.0], [0.0, 10.0], [5.0, 5.0], [3.0, -3.0]]
