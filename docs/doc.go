// Package docs holds nri-gpu's documentation. Its tests keep it true:
// every relative link in the repository's Markdown files resolves, and the
// package layers drawn in design.md are the code's (every package drawn
// once, none importing a package drawn beside or above it).
package docs
