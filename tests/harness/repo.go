package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// prepareRepository writes the model repository of opts into dir: per model a copy of
// the shipped config.pbtxt (or the Model's Config), rewritten as the Model asks, and an
// empty version folder 1/ (the weights stay where gpt_model_path points).
func prepareRepository(root, dir string, opts Options) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("prepare model repository: %w", err)
	}
	if opts.Empty {
		return nil
	}
	models := opts.Models
	if models == nil {
		models = []Model{{}}
	}
	shippedPath := filepath.Join(root, shippedModel, "config.pbtxt")
	shipped, err := os.ReadFile(shippedPath)
	if err != nil {
		return fmt.Errorf("prepare model repository: read the shipped config: %w", err)
	}
	for _, m := range models {
		if m.Name == "" {
			m.Name = "gpt2"
		}
		if m.Dir != "" {
			if err := os.CopyFS(filepath.Join(dir, m.Name), os.DirFS(filepath.Join(root, m.Dir))); err != nil {
				return fmt.Errorf("prepare model %s from %s: %w", m.Name, m.Dir, err)
			}
			continue
		}
		srcPath, src := shippedPath, shipped
		if m.Config != "" {
			srcPath = filepath.Join(root, m.Config)
			if src, err = os.ReadFile(srcPath); err != nil {
				return fmt.Errorf("prepare model %s: %w", m.Name, err)
			}
		}
		ckpt := m.Checkpoint
		if ckpt == "" {
			ckpt = filepath.Join(root, demoCheckpoint)
			if _, err := os.Stat(filepath.Join(ckpt, "model.safetensors")); err != nil {
				return fmt.Errorf("demo checkpoint missing in %s (run `make demo`): %w", ckpt, err)
			}
		} else if !filepath.IsAbs(ckpt) {
			ckpt = filepath.Join(root, ckpt)
		}
		cfg, err := rewriteConfig(string(src), m, ckpt)
		if err != nil {
			return fmt.Errorf("prepare model %s from %s: %w", m.Name, srcPath, err)
		}
		mdir := filepath.Join(dir, m.Name)
		if err := os.MkdirAll(filepath.Join(mdir, "1"), 0o755); err != nil {
			return fmt.Errorf("prepare model %s: %w", m.Name, err)
		}
		if err := os.WriteFile(filepath.Join(mdir, "config.pbtxt"), []byte(cfg), 0o644); err != nil {
			return fmt.Errorf("prepare model %s: %w", m.Name, err)
		}
	}
	return nil
}

// rewriteConfig applies m's changes to a config.pbtxt text: the model name, the
// checkpoint path, the extra parameters, decoupled and the instance count.
func rewriteConfig(cfg string, m Model, checkpoint string) (string, error) {
	var err error
	if cfg, err = setTopLevelName(cfg, m.Name); err != nil {
		return "", err
	}
	params := map[string]string{"gpt_model_path": checkpoint}
	for k, v := range m.Parameters {
		params[k] = v
	}
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cfg = setParameter(cfg, k, params[k])
	}
	if m.NonDecoupled {
		loc := decoupledRE.FindStringIndex(maskComments(cfg))
		if loc == nil {
			return "", fmt.Errorf("no `decoupled: true` to turn off")
		}
		cfg = cfg[:loc[0]] + "decoupled: false" + cfg[loc[1]:]
	}
	if m.InstanceCount > 0 {
		if cfg, err = setInstanceCount(cfg, m.InstanceCount); err != nil {
			return "", err
		}
	}
	if m.MaxBatchSize > 0 {
		loc := maxBatchRE.FindStringIndex(maskComments(cfg))
		if loc == nil {
			return "", fmt.Errorf("no max_batch_size to set")
		}
		cfg = cfg[:loc[0]] + fmt.Sprintf("max_batch_size: %d", m.MaxBatchSize) + cfg[loc[1]:]
	}
	if m.Outputs != nil {
		if cfg, err = keepOutputs(cfg, m.Outputs); err != nil {
			return "", err
		}
	}
	return cfg, nil
}

var (
	decoupledRE = regexp.MustCompile(`decoupled\s*:\s*true`)
	maxBatchRE  = regexp.MustCompile(`(?m)^max_batch_size\s*:\s*\d+`)
	// quotedRE matches one protobuf text-format string literal.
	quotedRE    = `"(?:[^"\\]|\\.)*"`
	nameFieldRE = regexp.MustCompile(`^name\s*:\s*` + quotedRE)
	stringValRE = regexp.MustCompile(`string_value\s*:\s*(` + quotedRE + `)`)
	countRE     = regexp.MustCompile(`count\s*:\s*\d+`)
)

// quote writes s as a protobuf text-format string literal.
func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}

// scan calls visit with the offset of every byte of cfg that is outside strings and
// comments, and its nesting depth there.
func scan(cfg string, visit func(i, depth int) bool) {
	depth := 0
	for i := 0; i < len(cfg); i++ {
		switch c := cfg[i]; c {
		case '"', '\'':
			for i++; i < len(cfg) && cfg[i] != c; i++ {
				if cfg[i] == '\\' {
					i++
				}
			}
			continue
		case '#':
			for i < len(cfg) && cfg[i] != '\n' {
				i++
			}
			continue
		case '{', '[':
			if !visit(i, depth) {
				return
			}
			depth++
			continue
		case '}', ']':
			depth--
		}
		if !visit(i, depth) {
			return
		}
	}
}

// setTopLevelName rewrites the model's own `name:` field; without one, Triton takes
// the folder's name, which is already right.
func setTopLevelName(cfg, name string) (string, error) {
	at := -1
	scan(cfg, func(i, depth int) bool {
		if depth == 0 && (i == 0 || !isIdent(cfg[i-1])) && nameFieldRE.MatchString(cfg[i:]) {
			at = i
			return false
		}
		return true
	})
	if at < 0 {
		return cfg, nil
	}
	loc := nameFieldRE.FindStringIndex(cfg[at:])
	return cfg[:at] + "name: " + quote(name) + cfg[at+loc[1]:], nil
}

func isIdent(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// maskComments returns cfg with every comment's text replaced by spaces, so that
// searches skip commented-out fields while offsets stay those of cfg.
func maskComments(cfg string) string {
	b := []byte(cfg)
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '"', '\'':
			for i++; i < len(b) && b[i] != c; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		case '#':
			for ; i < len(b) && b[i] != '\n'; i++ {
				b[i] = ' '
			}
		}
	}
	return string(b)
}

// parameterValue finds the string value of the parameter named key; loc is its
// `string_value: "..."` span in cfg.
func parameterValue(cfg, key string) (value string, loc []int, ok bool) {
	masked := maskComments(cfg)
	keyRE := regexp.MustCompile(`key\s*:\s*` + regexp.QuoteMeta(quote(key)) + `\s*value\s*:?\s*\{\s*`)
	k := keyRE.FindStringIndex(masked)
	if k == nil {
		return "", nil, false
	}
	v := stringValRE.FindStringSubmatchIndex(masked[k[1]:])
	if v == nil || v[0] != 0 {
		return "", nil, false
	}
	lit := cfg[k[1]+v[2] : k[1]+v[3]]
	value, err := strconv.Unquote(lit)
	if err != nil {
		value = lit[1 : len(lit)-1]
	}
	return value, []int{k[1] + v[0], k[1] + v[1]}, true
}

// ConfigParameter returns the string value of the config.pbtxt parameter named key,
// ignoring commented-out lines.
func ConfigParameter(cfg, key string) (string, bool) {
	v, _, ok := parameterValue(cfg, key)
	return v, ok
}

// setParameter sets the string value of the parameter named key, or appends the
// parameter when the config has none of that name.
func setParameter(cfg, key, value string) string {
	if _, loc, ok := parameterValue(cfg, key); ok {
		return cfg[:loc[0]] + "string_value: " + quote(value) + cfg[loc[1]:]
	}
	if !strings.HasSuffix(cfg, "\n") {
		cfg += "\n"
	}
	return cfg + fmt.Sprintf("parameters {\n  key: %s\n  value { string_value: %s }\n}\n", quote(key), quote(value))
}

// setInstanceCount sets the count of the (first) instance_group, adding one of kind
// KIND_CPU when the config has none.
func setInstanceCount(cfg string, n int) (string, error) {
	at := -1
	scan(cfg, func(i, depth int) bool {
		if depth == 0 && strings.HasPrefix(cfg[i:], "instance_group") && (i == 0 || !isIdent(cfg[i-1])) {
			at = i
			return false
		}
		return true
	})
	if at < 0 {
		return cfg + fmt.Sprintf("\ninstance_group [ { count: %d kind: KIND_CPU } ]\n", n), nil
	}
	// The group's first message: from the first '{' after the field name to its match.
	open := strings.IndexByte(cfg[at:], '{')
	if open < 0 {
		return "", fmt.Errorf("instance_group at offset %d has no message", at)
	}
	open += at
	end := -1
	scan(cfg[open:], func(i, depth int) bool {
		if cfg[open+i] == '}' && depth == 0 {
			end = open + i
			return false
		}
		return true
	})
	if end < 0 {
		return "", fmt.Errorf("instance_group at offset %d is not closed", at)
	}
	block := cfg[open:end]
	count := "count: " + strconv.Itoa(n)
	if loc := countRE.FindStringIndex(maskComments(block)); loc != nil {
		block = block[:loc[0]] + count + block[loc[1]:]
	} else {
		block = "{ " + count + " " + block[1:]
	}
	return cfg[:open] + block + cfg[end:], nil
}

// keepOutputs rewrites the top-level output list to hold only the entries named in
// names, in the config's order (the list's comments go with it); every name must be
// one of the config's outputs.
func keepOutputs(cfg string, names []string) (string, error) {
	field := regexp.MustCompile(`^output\s*:?\s*\[`)
	open, end := -1, -1
	var entries [][2]int
	scan(cfg, func(i, depth int) bool {
		switch {
		case open < 0:
			if depth == 0 && (i == 0 || !isIdent(cfg[i-1])) {
				if loc := field.FindStringIndex(cfg[i:]); loc != nil {
					open = i + loc[1] - 1
				}
			}
		case i <= open:
		case depth == 1 && cfg[i] == '{':
			entries = append(entries, [2]int{i, -1})
		case depth == 1 && cfg[i] == '}':
			entries[len(entries)-1][1] = i + 1
		case depth == 0 && cfg[i] == ']':
			end = i + 1
			return false
		}
		return true
	})
	if open < 0 || end < 0 {
		return "", fmt.Errorf("no output list to trim")
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var kept []string
	for _, e := range entries {
		text := cfg[e[0]:e[1]]
		m := outputNameRE.FindStringSubmatch(maskComments(text))
		if m == nil {
			return "", fmt.Errorf("output entry at offset %d has no name", e[0])
		}
		name, err := strconv.Unquote(m[1])
		if err != nil {
			return "", fmt.Errorf("output entry at offset %d: name %s: %w", e[0], m[1], err)
		}
		if want[name] {
			kept = append(kept, text)
			delete(want, name)
		}
	}
	if len(want) > 0 {
		missing := make([]string, 0, len(want))
		for n := range want {
			missing = append(missing, n)
		}
		sort.Strings(missing)
		return "", fmt.Errorf("outputs %q are not in the config", missing)
	}
	start := strings.LastIndex(cfg[:open], "output")
	return cfg[:start] + "output [\n  " + strings.Join(kept, ",\n  ") + "\n]" + cfg[end:], nil
}

// outputNameRE finds an output entry's name.
var outputNameRE = regexp.MustCompile(`\bname\s*:\s*(` + quotedRE + `)`)
