"""What a Cloud TPU slice is: the catalog (generations, accelerator types, topologies,
machine types) and the ICI/DCN parallelism rules. The model validates against it; the plan
builds on it."""
