"""Task images on the local backend: reading image sources (OCI image layouts, ``docker save``
tars, plain root directories), unpacking their layers once per digest, and the store that keeps
the unpacked trees under a size budget."""
