"""The compiler side: the ``kernelsmith`` torch.compile backend and what it is made of.

``backend`` is the entry point Dynamo calls (options, lookups, swapping hits into the graph); ``regions`` cuts a
Dynamo graph into regions and each region into a Problem; ``analysis_memo`` keeps a graph's analysis on disk;
``kernel_ops`` makes a cached kernel a ``torch.library`` op; ``graph_guard`` keeps a graph's swaps only where they
beat Inductor on the whole graph; ``explain`` shows what a compile would do. Importing it registers nothing.
"""
