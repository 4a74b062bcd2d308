"""The build pipeline: a project in, images out (load, plan, lock, install, context, make, bake
the warmup, record the rebuild). The commands call it; it calls the image and registry layers."""
