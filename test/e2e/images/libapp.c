//go:build ignore

// (The line above keeps the go command from treating this C file as a cgo source
// of package images, which only embeds it.)

/* libapp.so.1: an image's own library, installed in /opt/app/lib and found only
 * through the image's LD_LIBRARY_PATH. gpucheck's "app" step dlopens it. */
int app_hello(void) { return 42; }
