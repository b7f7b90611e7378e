// Package docs holds nri-gpu's documentation; its test checks that every relative link in the repository's Markdown files resolves.
package docs
