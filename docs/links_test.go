package docs

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"
)

// TestLinks checks every relative link of every Markdown file in the
// repository: the file or directory it names exists, inside the
// repository, and a #fragment names a heading of the Markdown file it
// points to. Links with a scheme (https:, mailto:) are not checked.
func TestLinks(t *testing.T) {
	fsys := os.DirFS("..")
	files, err := markdownFiles(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(files, "README.md") {
		t.Fatalf("README.md not found among %d Markdown files: is the test running in docs/?", len(files))
	}
	c := newChecker(fsys)
	for _, f := range files {
		problems, err := c.check(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Error(p)
		}
	}
}

func TestCheckerFindsBrokenLinks(t *testing.T) {
	fsys := fstest.MapFS{
		"docs/a.md": {Data: []byte("# Guide\n\n## Good heading\n\n## Good heading\n\n" +
			"### Requirements (`NVIDIA_REQUIRE_*`)\n\nSetext heading\n--------------\n\n" +
			"<a id=\"explicit\"></a>\n[up](../README.md#top) [self](#guide)\n")},
		"deploy/x.yaml": {Data: []byte("a: 1\n")},
	}
	for _, tc := range []struct {
		name string
		line string
		want []string // substrings of the problems, in order; none: no problem
	}{
		{"file", "[a](docs/a.md)", nil},
		{"heading", "[a](docs/a.md#good-heading)", nil},
		{"second heading of the same text", "[a](docs/a.md#good-heading-1)", nil},
		{"code span and punctuation", "[a](docs/a.md#requirements-nvidia_require_)", nil},
		{"setext heading", "[a](docs/a.md#setext-heading)", nil},
		{"explicit anchor", "[a](docs/a.md#explicit)", nil},
		{"directory", "[d](deploy/)", nil},
		{"non-Markdown file", "[x](deploy/x.yaml)", nil},
		{"line of a non-Markdown file", "[x](deploy/x.yaml#L1)", nil},
		{"root-relative", "[x](/deploy/x.yaml)", nil},
		{"same file", "[t](#top)", nil},
		{"reference definition", "[ref]: docs/a.md#guide", nil},
		{"image", "![i](deploy/x.yaml)", nil},
		{"external", "[e](https://example.com/missing.md#nothing) [m](mailto:a@b.c)", nil},
		{"in a code span", "`[x](missing.md)`", nil},
		{"in a code block", "```\n[x](missing.md)\n```", nil},
		{"missing file", "[x](missing.md)", []string{`README.md:2: link "missing.md": missing.md does not exist`}},
		{"missing heading", "[x](docs/a.md#bad-heading)", []string{`README.md:2: link "docs/a.md#bad-heading": docs/a.md has no heading #bad-heading`}},
		{"a third heading that is not there", "[x](docs/a.md#good-heading-2)", []string{"no heading #good-heading-2"}},
		{"wrong case", "[x](docs/a.md#Guide)", []string{"no heading #Guide"}},
		{"missing heading in the same file", "[x](#nowhere)", []string{"README.md has no heading #nowhere"}},
		{"outside the repository", "[x](../../elsewhere/notes.md)", []string{"leaves the repository"}},
		{"fragment of a directory", "[d](deploy/#x)", []string{"is a directory"}},
		{"fragment of a non-Markdown file", "[x](deploy/x.yaml#a)", []string{"not a Markdown heading"}},
		{"missing reference target", "[ref]: nothing.md", []string{"nothing.md does not exist"}},
		{"second reference definition", "[a]: docs/a.md\n[b]: nothing.md", []string{"README.md:3: link \"nothing.md\""}},
		{"not a reference definition", "Measured 1.0\n[1.0–1.1]: the cost", nil},
		{"two on a line", "[x](docs/a.md#guide) and [y](nope.md)", []string{"nope.md does not exist"}},
		{"line numbers", "text\n\n[x](a.md)", []string{"README.md:4:"}},
		{"link text with a code span", "[`x`](gone.md)", []string{"gone.md does not exist"}},
		{"code span over two lines", "`a\n[x](missing.md)` [y](gone.md)", []string{"gone.md does not exist"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fstest.MapFS{}
			for k, v := range fsys {
				f[k] = v
			}
			f["README.md"] = &fstest.MapFile{Data: []byte("# Top\n" + tc.line + "\n")}
			got, err := newChecker(f).check("README.md")
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("problems: %q, want %d: %q", got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("problem %d: %q, want it to contain %q", i, got[i], tc.want[i])
				}
			}
		})
	}
	// The file in docs/ links up to the README: relative to its own directory.
	f := fstest.MapFS{"README.md": {Data: []byte("# Top\n")}}
	for k, v := range fsys {
		f[k] = v
	}
	if got, err := newChecker(f).check("docs/a.md"); err != nil || len(got) != 0 {
		t.Errorf("docs/a.md: %q, %v; want no problem", got, err)
	}
}

func TestAnchor(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"Try it", "try-it"},
		{"Who holds which GPU", "who-holds-which-gpu"},
		{"Compatibility with the NVIDIA toolkit and schedulers", "compatibility-with-the-nvidia-toolkit-and-schedulers"},
		{"Requirements (`NVIDIA_REQUIRE_*`)", "requirements-nvidia_require_"},
		{"`libraryMode: files`", "librarymode-files"},
		{"nri-gpu doctor", "nri-gpu-doctor"},
		{"The create phase: nri-gpu over NRI against containerd's CDI", "the-create-phase-nri-gpu-over-nri-against-containerds-cdi"},
		{"A, B and C", "a-b-and-c"},
		{"Two  spaces", "two--spaces"},
		{"[Linked](https://example.com) heading", "linked-heading"},
		{"Größe 2.4.2", "größe-242"},
	} {
		if got := anchor(tc.heading); got != tc.want {
			t.Errorf("anchor(%q) = %q, want %q", tc.heading, got, tc.want)
		}
	}
}

// markdownFiles lists the Markdown files of fsys, leaving out .git, the
// end-to-end suite's tool cache and test data.
func markdownFiles(fsys fs.FS) ([]string, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" || d.Name() == "testdata" || p == "test/e2e/.cache" {
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(strings.ToLower(p), ".md") {
			files = append(files, p)
		}
		return nil
	})
	return files, err
}

// checker checks the links of Markdown files in one file system, keeping
// the anchors of each target it has read.
type checker struct {
	fsys    fs.FS
	anchors map[string]map[string]bool
}

func newChecker(fsys fs.FS) *checker {
	return &checker{fsys: fsys, anchors: map[string]map[string]bool{}}
}

// check returns one line per broken relative link of the Markdown file
// name: "file:line: link "target": what is wrong".
func (c *checker) check(name string) ([]string, error) {
	src, err := fs.ReadFile(c.fsys, name)
	if err != nil {
		return nil, err
	}
	var problems []string
	for _, l := range links(string(src)) {
		if why := c.resolve(name, l.target); why != "" {
			problems = append(problems, fmt.Sprintf("%s:%d: link %q: %s", name, l.line, l.target, why))
		}
	}
	return problems, nil
}

var (
	scheme     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	lineAnchor = regexp.MustCompile(`^L[0-9]+(-L[0-9]+)?$`)
)

// resolve says what is wrong with target, a link in the file from, or
// returns "" when it resolves (or is not relative).
func (c *checker) resolve(from, target string) string {
	if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
		return ""
	}
	p, frag, _ := strings.Cut(target, "#")
	p, _, _ = strings.Cut(p, "?")
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	var file string
	switch {
	case p == "":
		file = from
	case strings.HasPrefix(p, "/"):
		file = path.Clean(strings.TrimPrefix(p, "/"))
	default:
		file = path.Join(path.Dir(from), p)
	}
	if file == ".." || strings.HasPrefix(file, "../") {
		return "leaves the repository"
	}
	st, err := fs.Stat(c.fsys, file)
	if err != nil {
		return file + " does not exist"
	}
	if frag == "" {
		return ""
	}
	if st.IsDir() {
		return file + " is a directory: a #fragment has nothing to name"
	}
	if !strings.HasSuffix(strings.ToLower(file), ".md") {
		if lineAnchor.MatchString(frag) {
			return ""
		}
		return file + " is not Markdown: #" + frag + " is not a Markdown heading (only #L<n> line anchors are)"
	}
	a, err := c.anchorsOf(file)
	if err != nil {
		return err.Error()
	}
	if u, err := url.PathUnescape(frag); err == nil {
		frag = u
	}
	if !a[frag] {
		return file + " has no heading #" + frag
	}
	return ""
}

// anchorsOf returns the anchors GitHub gives the headings of a Markdown
// file (and "top", which GitHub accepts on every page), plus explicit
// <a id="..."> or <a name="..."> anchors.
func (c *checker) anchorsOf(file string) (map[string]bool, error) {
	if a, ok := c.anchors[file]; ok {
		return a, nil
	}
	src, err := fs.ReadFile(c.fsys, file)
	if err != nil {
		return nil, err
	}
	a := map[string]bool{"top": true}
	seen := map[string]int{}
	for _, h := range headings(string(src)) {
		slug := anchor(h)
		if n := seen[slug]; n > 0 {
			a[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			a[slug] = true
		}
		seen[slug]++
	}
	for _, m := range explicitAnchor.FindAllStringSubmatch(string(src), -1) {
		a[m[1]] = true
	}
	c.anchors[file] = a
	return a, nil
}

var explicitAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)

// link is one link target and the line it starts on.
type link struct {
	target string
	line   int
}

// paragraph is a run of non-blank lines outside code blocks, starting at
// line first (1-based). Code spans and inline links do not cross it.
type paragraph struct {
	text  string
	first int
}

// paragraphs splits Markdown into paragraphs and headings, leaving out
// fenced code blocks (``` or ~~~).
func paragraphs(src string) []paragraph {
	var out []paragraph
	var cur []string
	first := 0
	flush := func() {
		if len(cur) > 0 {
			out = append(out, paragraph{strings.Join(cur, "\n"), first})
		}
		cur = nil
	}
	fence := ""
	for i, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				fence = ""
			}
			continue
		}
		if m := fenceOpen.FindString(trimmed); m != "" && len(line)-len(trimmed) < 4 {
			flush()
			fence = m
			continue
		}
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if atxHeading.MatchString(line) { // a heading is a block of its own
			flush()
			out = append(out, paragraph{line, i + 1})
			continue
		}
		if len(cur) == 0 {
			first = i + 1
		}
		cur = append(cur, line)
	}
	flush()
	return out
}

var fenceOpen = regexp.MustCompile("^(```+|~~~+)")

// blankCodeSpans replaces each inline code span (a run of backticks, then
// anything up to a run of the same length) with spaces, keeping newlines,
// so that nothing in code reads as a link.
func blankCodeSpans(s string) string {
	b := []byte(s)
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(b) && b[i+n] == '`' {
			n++
		}
		end := -1
		for j := i + n; j < len(b); {
			if b[j] != '`' {
				j++
				continue
			}
			m := 0
			for j+m < len(b) && b[j+m] == '`' {
				m++
			}
			if m == n {
				end = j + m
				break
			}
			j += m
		}
		if end < 0 {
			i += n // a lone run of backticks is literal
			continue
		}
		for k := i; k < end; k++ {
			if b[k] != '\n' {
				b[k] = ' '
			}
		}
		i = end
	}
	return string(b)
}

var refDef = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:[ \t]*<?([^\s>]+)`)
var htmlLink = regexp.MustCompile(`(?:href|src)="([^"]+)"`)

// links returns the link targets of a Markdown text: inline links and
// images, reference definitions and HTML href/src attributes, outside code.
func links(src string) []link {
	var out []link
	for _, p := range paragraphs(src) {
		text := blankCodeSpans(p.text)
		lineOf := func(off int) int { return p.first + strings.Count(text[:off], "\n") }
		for i := 0; ; {
			j := strings.Index(text[i:], "](")
			if j < 0 {
				break
			}
			start := i + j + 2
			if target, ok := destination(text[start:]); ok && target != "" {
				out = append(out, link{target, lineOf(start)})
			}
			i = start
		}
		// Reference definitions open a paragraph (they cannot interrupt
		// one): "[1.0–1.1]: the cost" in running text is not one.
		for i, line := range strings.Split(text, "\n") {
			m := refDef.FindStringSubmatchIndex(line)
			if m == nil {
				break
			}
			out = append(out, link{line[m[2]:m[3]], p.first + i})
		}
		for _, m := range htmlLink.FindAllStringSubmatchIndex(text, -1) {
			out = append(out, link{text[m[2]:m[3]], lineOf(m[2])})
		}
	}
	return out
}

// destination reads a link destination at the start of s (just after
// "]("): <...>, or up to whitespace or the parenthesis that closes it.
func destination(s string) (string, bool) {
	if strings.HasPrefix(s, "<") {
		end := strings.IndexAny(s, ">\n")
		if end < 0 || s[end] != '>' {
			return "", false
		}
		return s[1:end], true
	}
	depth := 0
	for i, r := range s {
		switch {
		case r == '(':
			depth++
		case r == ')':
			if depth == 0 {
				return s[:i], true
			}
			depth--
		case unicode.IsSpace(r):
			return s[:i], true
		}
	}
	return "", false
}

var atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
var setextUnderline = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)

// headings returns the text of every ATX (# ...) and setext (underlined)
// heading, outside code blocks, in order.
func headings(src string) []string {
	var out []string
	for _, p := range paragraphs(src) {
		lines := strings.Split(p.text, "\n")
		var para []string
		for _, line := range lines {
			if m := atxHeading.FindStringSubmatch(line); m != nil {
				para = nil
				out = append(out, strings.TrimSpace(m[1]))
				continue
			}
			if setextUnderline.MatchString(line) && len(para) > 0 {
				out = append(out, strings.TrimSpace(strings.Join(para, " ")))
				para = nil
				continue
			}
			para = append(para, line)
		}
	}
	return out
}

var inlineLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
var htmlTag = regexp.MustCompile(`<[^>]+>`)

// anchor returns the anchor GitHub gives a heading: its text as rendered
// (links by their text, code spans by their content, no HTML tags),
// lowercased, every character but letters, digits, '-', '_' and spaces
// removed, and each space made a '-'.
func anchor(heading string) string {
	s := inlineLink.ReplaceAllString(heading, "$1")
	s = htmlTag.ReplaceAllString(s, "")
	s = strings.ReplaceAll(s, "`", "")
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
