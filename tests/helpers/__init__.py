"""Reference-side code the tests share: the torchvision import shim, torch model helpers, the detector references and a compilation counter."""
